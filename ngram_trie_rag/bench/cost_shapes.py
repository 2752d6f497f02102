"""The model shapes, draft sizes and contexts ``cost-curve`` measures by default; no
torch, so the command line's parser can offer them."""

# Model shapes (architecture, config fields) of the models users run. Random weights.
SHAPES: dict[str, tuple[str, dict]] = {
    "tiny-llama": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 vocab_size=512)),
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536,
                                   num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, vocab_size=49152,
                                   tie_word_embeddings=True, rope_theta=100000.0)),
    "llama-3.2-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192,
                                   num_hidden_layers=16, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=64, vocab_size=128256,
                                   tie_word_embeddings=True, rope_theta=500000.0)),
    "llama-3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, vocab_size=128256,
                                   rope_theta=500000.0)),
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944,
                                 num_hidden_layers=28, num_attention_heads=28,
                                 num_key_value_heads=4, vocab_size=152064,
                                 rope_theta=1000000.0)),
}
DRAFT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
CONTEXTS = (1024, 2048, 4096)
