"""What the display commands show: status rows, history, the finished-jobs listings."""
