"""The ledger: one row per request (its tables and migrations, the row, the sink that writes it), prices, stored
prompts and stored Responses answers, in SQLite or PostgreSQL."""
