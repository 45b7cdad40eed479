"""Where KV lives: the layouts (unified buffer, KV streams), the prefix cache over them, and the RAM and disk tiers."""
