import sys

from slurm_gpushare.cli import main

sys.exit(main())
