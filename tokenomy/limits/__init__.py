"""Every limit on a request in one place: API keys and tenants, rate windows, spend budgets, leased allowances, and
the Redis counters that several gateways share."""
