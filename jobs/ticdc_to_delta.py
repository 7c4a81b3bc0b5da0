"""spark-submit entry point: ``spark-submit jobs/ticdc_to_delta.py --config FILE [--once]``.

Same options and exit codes as ``python -m ticdc_delta run`` (0 done, 1 terminal, 75 retryable, 143 / 130
stopped by SIGTERM / SIGINT).
"""

import sys

from ticdc_delta.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]], process_exit=True))
