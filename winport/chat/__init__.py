"""Chat prompt encodings the port carries itself (pure Python, no SGLang import)."""
