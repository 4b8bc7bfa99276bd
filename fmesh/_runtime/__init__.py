"""The process-group runtime, what one process does: realize, its memo, groups, recovery
(over the cross-rank protocol of ``_protocol/``)."""
