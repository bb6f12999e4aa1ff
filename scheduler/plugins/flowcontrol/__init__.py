"""Flow-control policies (GIE / llm-d flow control's ordering, fairness and usage-limit plugins),
one per module. Ordering and fairness policies are named by a priority band's `orderingPolicyRef`
/ `fairnessPolicyRef`, the usage-limit policy by `flowControl.usageLimitPolicyPluginRef`;
`fcfs-ordering-policy`, `global-strict-fairness-policy` and `static-usage-limit-policy` are the
defaults and need not be declared."""
