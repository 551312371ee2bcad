#!/bin/bash
echo yes > /app/answer.txt
