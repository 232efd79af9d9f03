import sys

from klstudy.run.cli import main

sys.exit(main())
