#!/bin/bash
echo "hello from tito" > /app/greeting.txt
