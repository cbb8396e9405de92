"""`python -m gradlab`: see `gradlab.cli`."""

import sys

from gradlab.cli import main

sys.exit(main())
