import sys

from dra_driver.cli import main

sys.exit(main())
