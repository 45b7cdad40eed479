"""The Batch API's durable files, batches and items, their worker, and `tokenomy batch`."""
