import sys

from efo.cli import main

sys.exit(main())
