"""`python -m tffleet.cli`: how `tffleet up` starts its own processes."""

import sys

from tffleet.cli.main import main

sys.exit(main())
