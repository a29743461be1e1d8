"""`python -m winport ...` (the installer uses this before the console script exists)."""

from winport.cli import main

raise SystemExit(main())
