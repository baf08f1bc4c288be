import sys

from worker.bootstrap import main

sys.exit(main())
