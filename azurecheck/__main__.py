"""python -m azurecheck preflight --stack STACK [--data-stack STACK] | doctor --stack STACK"""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
