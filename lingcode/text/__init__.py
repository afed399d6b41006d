"""Text in and out of the model: the tokenizer, chat templates, and the model families' facts
(lingcode/data/families.toml). Detokenizing and stop strings live with the text stream
(lingcode.pipeline.generation)."""
