# The router image used by docker-compose.yml: the package and its CLI.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY router ./router
COPY cli ./cli
COPY lua ./lua
RUN pip install --no-cache-dir .
ENTRYPOINT ["router"]
