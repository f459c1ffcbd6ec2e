"""Pure functions from records to text, HTML and charts. Importing this package registers how
every record shows (``gpunb.display.register_views``); ``gpunb/__init__.py`` does it the first
time a record is displayed. Views read records and never measure, import the shells, or change
what they show."""

from gpunb.views import (  # noqa: F401  (they register)
    check_view,
    energy_view,
    fit_view,
    memory_view,
    oom_view,
    plan_view,
    profile_view,
    ranks_view,
    session_energy_view,
    trace_view,
)
