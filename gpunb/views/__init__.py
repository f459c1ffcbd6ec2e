"""Pure functions from records to text, HTML and charts. Importing this package registers how
every record shows (``gpunb.display.register_views``); ``gpunb/__init__.py`` does it the first
time a record is displayed. Views read records and never measure, import the shells, or change
what they show."""

from gpunb.views import check_view, memory_view, profile_view, ranks_view  # noqa: F401  (they register)
