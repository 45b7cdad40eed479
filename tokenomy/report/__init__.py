"""`tokenomy report` and the report page: efficiency figures as plain functions of ledger rows, cross-checked."""
