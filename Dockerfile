# One image for every component, chosen by command:
#   webhook (default)   python -m webhook --bind 0.0.0.0:8443 --certs-dir /certs
#   certificates        python -m certs ensure|inject|generate ...
#   reconcilers         python -m reconcilers run
#   scheduler extender  python -m scheduler --bind 0.0.0.0:8444
# Build: docker build -t oversale:0.1.0 .

# Dependencies in their own stage and layer: rebuilt only when requirements.txt changes.
FROM python:3.11-slim AS dependencies
RUN python -m venv /opt/venv
COPY requirements.txt /tmp/requirements.txt
RUN /opt/venv/bin/pip install --no-cache-dir --only-binary=:all: -r /tmp/requirements.txt

# The final image: the slim base, the virtualenv and the sources; no compilers, no pip cache.
FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --gid 10001 oversale \
 && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin oversale
COPY --from=dependencies /opt/venv /opt/venv
WORKDIR /app
COPY oversale/ oversale/
COPY kube/ kube/
COPY webhook/ webhook/
COPY certs/ certs/
COPY reconcilers/ reconcilers/
COPY scheduler/ scheduler/
COPY simulator/ simulator/
USER 10001:10001
EXPOSE 8443
ENTRYPOINT ["python", "-m"]
CMD ["webhook", "--bind", "0.0.0.0:8443", "--certs-dir", "/certs", "--metrics-dir", "/tmp/metrics"]
