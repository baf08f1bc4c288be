"""`python -m agent.dashboard`: the same as `python -m agent dashboard`."""

from __future__ import annotations

from agent.dashboard import main

raise SystemExit(main())
