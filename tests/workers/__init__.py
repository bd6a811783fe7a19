"""Scripts the tests run as other processes (training ranks); importable for their constants."""
