# Temporary alias of core.db_roles (moved there), for branches started before the move.
import sys

from core import db_roles as _moved

sys.modules[__name__] = _moved
