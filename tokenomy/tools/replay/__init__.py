"""`tokenomy replay`: what-if on recorded traffic. The ledger's rows (and the request bodies stored beside them
for tenants that opted in) are run again, offline, through candidate cache settings, routes and prices, and each
policy's outcome is set against what was recorded."""
