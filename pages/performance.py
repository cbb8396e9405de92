"""Placeholder: this page is being built."""

import streamlit as st

st.title("performance")
st.info("This page is being built.")
