# An S3-protocol server image for the container tests only (tests/containers/
# test_stack_object_store.py): moto's server mode on the cube image's Python, at the pins
# of requirements/constraints.txt. Built by the test: docker build -f <this> <repo>/requirements
ARG BASE=elastic-ctr-cube:dev
FROM ${BASE}
USER root
COPY constraints.txt /tmp/constraints.txt
RUN /opt/venv/bin/pip install -q "moto==5.2.5" "flask-cors==6.0.5" "boto3==1.43.117" -c /tmp/constraints.txt \
 && rm /tmp/constraints.txt
USER 10001
ENTRYPOINT ["/opt/venv/bin/python", "-m", "moto.server"]
