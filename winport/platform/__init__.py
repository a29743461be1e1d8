"""SGLang plugin entry points: the hardware platform and the hooks (registered in pyproject.toml)."""
