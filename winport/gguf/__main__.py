"""``python -m winport.gguf info FILE`` / ``dump FILE TENSOR --npy OUT``."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
