import sys

from queryserve.cli import main

sys.exit(main())
