#!/bin/sh
# The hosts of deploy/docker-compose.yml.
echo agent1:1
echo agent2:1
