import sys

from klstudy.cli import main

sys.exit(main())
