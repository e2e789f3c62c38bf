"""One study run: a Lightning fit of ``LlamaLM`` with its divergence check, depth statistics, stability columns and
layer importance, and the state it saves when its job is stopped."""
