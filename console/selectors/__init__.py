"""What the console's pages read: one module per page family.

Views call these modules only (an import-linter contract in pyproject.toml
holds it); each builds its pages from the apps' selectors. Who may see what
is decided there, in the apps' selectors (``visible_tickets``,
``visible_cases``, ``is_owner``, ``sees_configuration``, ...): a module
here composes them and never filters by its own rule, so a page and the API
show a user the same things.

| module | its pages |
| --- | --- |
| ``dashboard`` | the dashboard |
| ``tickets`` | the ticket list and a ticket's page |
| ``traces`` | a trace: its lineage and waterfall |
| ``endpoints`` | the endpoint list and an endpoint's page (its agent and governance) |
| ``proposals`` | a change proposal's page |
| ``cases`` | recovery cases and lessons |
| ``obligations`` | open obligations (and the dashboard's overdue ones) |
| ``workers`` | the workers page (staff) |
| ``live`` | what a live region watches |
| ``charts`` | the throughput and turn charts the dashboard and endpoint pages draw |

Every query is bounded: the ledger grows without limit, so nothing here
counts or scans a whole table to draw a page. Lists are keyset-paginated or
capped (``LIST_CAP``), and counts by state are capped.
"""

LIST_CAP = 200
