"""Reading run records (export/record.py writes them): replay into a stack, the report
page, step timelines. Nothing here runs inside training; it reads files on disk."""
