"""What people read: rich tables and lines, plain and JSON output, and the plot (terminal grid and
files)."""
