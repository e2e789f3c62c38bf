import sys

from bhyt_pl.bench import main

sys.exit(main(sys.argv[1:]))
