# Temporary alias of accounts.keys (moved there), for branches started before the move.
import sys

from accounts import keys as _moved

sys.modules[__name__] = _moved
