"""`python -m tinydiff.cli`, as the `tinydiff` command (tests/test_fuzz.py runs it so)."""
import sys

from . import main

sys.exit(main())
