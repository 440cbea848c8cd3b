"""Operator console: plain function views, one module per page family,
beside the selector module of the same family (console/selectors/).

Reads go through ``console.selectors`` only, writes through one service call
each (``common.act``); no view sets a state field. Authorisation lives in
the view and the selectors, never only in a template: htmx can ask for any
region, and a POST can come from anywhere.

Each page is one template; its live region is a ``{% partialdef %}`` that
the view renders alone (``page.html#region``) when htmx asks for it
(``common.page``).
"""
