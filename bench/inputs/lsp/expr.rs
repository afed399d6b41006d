//! A calculator for arithmetic expressions: a tokenizer, a recursive-descent parser that builds
//! a tree, and an evaluator with named variables.

use std::collections::HashMap;
use std::fmt;

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Number(f64),
    Name(String),
    Op(char),
    LParen,
    RParen,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Number(f64),
    Var(String),
    Neg(Box<Expr>),
    Binary(char, Box<Expr>, Box<Expr>),
}

#[derive(Debug, PartialEq)]
pub enum Error {
    UnexpectedChar(char, usize),
    UnexpectedEnd,
    UnexpectedToken(String),
    UnknownVariable(String),
    DivisionByZero,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UnexpectedChar(c, at) => write!(f, "unexpected character {c:?} at {at}"),
            Error::UnexpectedEnd => write!(f, "the expression ends too early"),
            Error::UnexpectedToken(t) => write!(f, "unexpected {t}"),
            Error::UnknownVariable(name) => write!(f, "unknown variable {name}"),
            Error::DivisionByZero => write!(f, "division by zero"),
        }
    }
}

fn tokenize(input: &str) -> Result<Vec<Token>, Error> {
    let chars: Vec<char> = input.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            let value = text.parse().map_err(|_| Error::UnexpectedChar(c, start))?;
            tokens.push(Token::Number(value));
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(Token::Name(chars[start..i].iter().collect()));
        } else if "+-*/^".contains(c) {
            tokens.push(Token::Op(c));
            i += 1;
        } else if c == '(' || c == ')' {
            tokens.push(if c == '(' { Token::LParen } else { Token::RParen });
            i += 1;
        } else {
            return Err(Error::UnexpectedChar(c, i));
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        token
    }

    // expr := term (('+' | '-') term)*
    fn expr(&mut self) -> Result<Expr, Error> {
        let mut left = self.term()?;
        while let Some(Token::Op(op @ ('+' | '-'))) = self.peek().cloned() {
            self.pos += 1;
            let right = self.term()?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    // term := power (('*' | '/') power)*
    fn term(&mut self) -> Result<Expr, Error> {
        let mut left = self.power()?;
        while let Some(Token::Op(op @ ('*' | '/'))) = self.peek().cloned() {
            self.pos += 1;
            let right = self.power()?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    // power := unary ('^' power)?   (right-associative)
    fn power(&mut self) -> Result<Expr, Error> {
        let base = self.unary()?;
        if let Some(Token::Op('^')) = self.peek() {
            self.pos += 1;
            let exponent = self.power()?;
            return Ok(Expr::Binary('^', Box::new(base), Box::new(exponent)));
        }
        Ok(base)
    }

    fn unary(&mut self) -> Result<Expr, Error> {
        match self.next() {
            Some(Token::Op('-')) => Ok(Expr::Neg(Box::new(self.unary()?))),
            Some(Token::Number(value)) => Ok(Expr::Number(value)),
            Some(Token::Name(name)) => Ok(Expr::Var(name)),
            Some(Token::LParen) => {
                let inner = self.expr()?;
                match self.next() {
                    Some(Token::RParen) => Ok(inner),
                    Some(other) => Err(Error::UnexpectedToken(format!("{other:?}"))),
                    None => Err(Error::UnexpectedEnd),
                }
            }
            Some(other) => Err(Error::UnexpectedToken(format!("{other:?}"))),
            None => Err(Error::UnexpectedEnd),
        }
    }
}

pub fn parse(input: &str) -> Result<Expr, Error> {
    let mut parser = Parser { tokens: tokenize(input)?, pos: 0 };
    let expr = parser.expr()?;
    match parser.next() {
        None => Ok(expr),
        Some(token) => Err(Error::UnexpectedToken(format!("{token:?}"))),
    }
}

pub fn eval(expr: &Expr, vars: &HashMap<String, f64>) -> Result<f64, Error> {
    Ok(match expr {
        Expr::Number(value) => *value,
        Expr::Var(name) => *vars.get(name).ok_or_else(|| Error::UnknownVariable(name.clone()))?,
        Expr::Neg(inner) => -eval(inner, vars)?,
        Expr::Binary(op, left, right) => {
            let (a, b) = (eval(left, vars)?, eval(right, vars)?);
            match op {
                '+' => a + b,
                '-' => a - b,
                '*' => a * b,
                '/' if b == 0.0 => return Err(Error::DivisionByZero),
                '/' => a / b,
                '^' => a.powf(b),
                _ => unreachable!("the parser makes no other operators"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calc(input: &str) -> Result<f64, Error> {
        let vars = HashMap::from([("x".to_string(), 3.0)]);
        eval(&parse(input)?, &vars)
    }

    #[test]
    fn precedence_and_associativity() {
        assert_eq!(calc("1 + 2 * 3"), Ok(7.0));
        assert_eq!(calc("2 ^ 3 ^ 2"), Ok(512.0));
        assert_eq!(calc("-(x - 5) * 2"), Ok(4.0));
    }

    #[test]
    fn errors() {
        assert_eq!(calc("1 / 0"), Err(Error::DivisionByZero));
        assert_eq!(calc("y + 1"), Err(Error::UnknownVariable("y".into())));
        assert_eq!(calc("(1 + 2"), Err(Error::UnexpectedEnd));
    }
}
