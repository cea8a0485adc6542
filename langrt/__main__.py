import sys

from langrt.cli import main

sys.exit(main())
