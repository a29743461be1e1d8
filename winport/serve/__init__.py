"""`winport serve`: SGLang's OpenAI-compatible server on the port's platform, shims and loaders."""
