import sys

from ssdemu.cli import main

sys.exit(main())
