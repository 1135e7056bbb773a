"""Serverless entry points (AWS Lambda: handlers.app.lambda_handler)."""
