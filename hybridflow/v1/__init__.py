"""Generated gRPC code (make proto). Never edit by hand."""
