"""Helpers that built-in plugins share; nothing here is a plugin and nothing here registers one.

The scheduling core (types, interfaces, loop, profiles, config, admission) never imports this
package: `inflight` (the ledger of work sent and not yet answered), `prefill_ledger` (the hooks of
the prefill-backlog scorer and detector), `prefix` (prompt block hashing, the prefix index, and
the match info the prefix-cache scorer attaches to endpoints)."""
