import sys

from bhyt_pl.study import main

sys.exit(main())
