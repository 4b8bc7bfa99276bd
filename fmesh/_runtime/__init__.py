"""The process-group runtime: realize, its memo, the cross-rank agreement, recovery."""
