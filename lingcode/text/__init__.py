"""Text in and out of the model: tokenizer, chat templates, incremental detokenization, stop
strings, and the model families' facts (lingcode/data/families.toml)."""
