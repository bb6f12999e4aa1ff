"""Flow-control policies (GIE / llm-d flow control's ordering and fairness plugins), one per
module. They are named by a priority band's `orderingPolicyRef` / `fairnessPolicyRef`;
`fcfs-ordering-policy` and `global-strict-fairness-policy` are the defaults and need not be
declared."""
