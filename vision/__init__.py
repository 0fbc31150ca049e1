"""Vision side of the Qwen3-VL backbone: image preprocessing (`vision.preprocess`) and the torch reference
vision tower with DeepStack (`vision.encoder`)."""
