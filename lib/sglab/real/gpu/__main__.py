"""``python -m sglab.real.gpu record ...``: see :mod:`sglab.real.gpu.record`."""

import sys

from sglab.real.gpu.record import main

sys.exit(main())
