"""The control plane: a relational database shared by managers and workers (SQLAlchemy 2).

Leader election with a fencing term, membership and heartbeats, deployments and the
placement of their instances, state revisions and an event log. SQLite, MySQL/MariaDB and
PostgreSQL behave the same.
"""
