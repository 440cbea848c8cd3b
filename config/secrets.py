# Temporary alias of core.secrets (moved there), for branches started before the move.
import sys

from core import secrets as _moved

sys.modules[__name__] = _moved
